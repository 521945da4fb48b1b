from .schema import *  # noqa
