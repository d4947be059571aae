from django import template

from core.formatting import detail_items, duration, eta, number, state_label, until, when

register = template.Library()

register.filter("duration", duration)
register.filter("eta", eta)
register.filter("detail_items", detail_items)
register.filter("num", number)
register.filter("when", when)
register.filter("until", until)
register.filter("state_label", state_label)
