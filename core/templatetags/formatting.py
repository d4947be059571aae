from django import template

from core.formatting import duration

register = template.Library()

register.filter("duration", duration)
