"""The machine's write-back, sampled beside a bench run (``python -m bench.iosample OUT SECONDS
[DEVICE]``): every 100 ms one line ``epoch dirty_kB writeback_kB sectors_written
ms_spent_writing`` from ``/proc/meminfo`` and ``/proc/diskstats`` (DEVICE, default ``vda``).

Set against a run's ``foreground.stalls`` (seconds after its release) it shows whether a stall
of the foreground fell where the kernel wrote back a burst of dirty pages: ``Dirty`` dropping
by hundreds of MB within a sample, the device's time spent writing jumping by seconds.
"""

from __future__ import annotations

import sys
import time


def written(device: str) -> tuple[int, int]:
    with open("/proc/diskstats") as f:
        for line in f:
            fields = line.split()
            if fields[2] == device:
                return int(fields[9]), int(fields[13])
    raise SystemExit(f"no device {device!r} in /proc/diskstats")


def main(out_path: str, seconds: float, device: str = "vda") -> None:
    end = time.time() + seconds
    with open(out_path, "w") as out:
        while time.time() < end:
            mem = {}
            with open("/proc/meminfo") as f:
                for line in f:
                    key, value = line.split(":")
                    if key in ("Dirty", "Writeback"):
                        mem[key] = int(value.split()[0])
            sectors, ms = written(device)
            out.write(f"{time.time():.2f} {mem['Dirty']} {mem['Writeback']} {sectors} {ms}\n")
            out.flush()
            time.sleep(0.1)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), *sys.argv[3:4])
