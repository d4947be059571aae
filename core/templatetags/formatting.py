from django import template

from core.formatting import duration, number, state_label, when

register = template.Library()

register.filter("duration", duration)
register.filter("num", number)
register.filter("when", when)
register.filter("state_label", state_label)
