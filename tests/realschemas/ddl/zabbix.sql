-- Zabbix: the numeric history table, as Zabbix 5.0 creates it on PostgreSQL: no primary key,
-- one index on (itemid, clock), clock in epoch seconds (integer)
-- Repository: https://github.com/zabbix/zabbix
-- Path: create/src/schema.tmpl (TABLE|history||0, FIELD itemid/clock/value/ns, INDEX 1|itemid,clock)
-- Commit: 83b0a37717a040c1b72985cd15bc82adb98914e3 (the stored version of schema.tmpl; the
--         history tables keep this shape up to 5.4 — 6.0 added a primary key (itemid, clock, ns))
-- Licence: GPL-2.0 (Zabbix up to 6.4; AGPL-3.0 from 7.0). The table written out as the
-- template's PostgreSQL generator emits it; items cut down to the keys and a name.
CREATE TABLE items (
    itemid bigint NOT NULL PRIMARY KEY,
    name varchar(255) DEFAULT '' NOT NULL,
    history varchar(255) DEFAULT '90d' NOT NULL
);

CREATE TABLE history (
    itemid bigint NOT NULL,
    clock integer DEFAULT '0' NOT NULL,
    value DOUBLE PRECISION DEFAULT '0.0000' NOT NULL,
    ns integer DEFAULT '0' NOT NULL
);
CREATE INDEX history_1 ON history (itemid, clock);
