"""How numbers and tables print, in one place: fixed digits that never show ``-0.0000``, plain
text tables, HTML tables for notebooks and reports, and pandas frames (the ``[frame]`` extra).

Sits below every other part of the aggregator: may import the standard library and pandas (lazily,
in ``tables.data_frame``); never ``client`` or any other ``aggregator`` module, so the statistics,
the report and the command line can all format through it.
"""
