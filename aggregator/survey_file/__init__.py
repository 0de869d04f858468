"""The survey file layer: a survey's TOML file read into survey definitions and per-survey
limits (``config``), the tests it declares (``analyses``), a goodness-of-fit null as users write
it (``null_text``), which two groups a two-sample test compares (``groups``), and a survey's
sampling frame (``design``).

May import ``client``, ``aggregator.errors``, ``aggregator.histogram`` and numpy; never
``aggregator.service``, ``store``, ``stats``, ``jobs`` or ``cli``: every part that reads a survey
file sits above it.
"""
