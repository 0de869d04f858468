"""The Analyst: estimates, tests, monitoring and explore-then-confirm over released statistics
only, on its own listener with its own credentials (``auth``, ``tokens``) and an audit log of
state changes (``audit``). The servicer (``servicer``) reads every question through one
released-reads object (``reads``, by the release rule of ``release``), hands design-based
answers, monitoring and the confirmation RPCs to their modules (``design``, ``monitor``,
``confirm``), and runs the statistics (``statistics``: typed, SciPy loaded on first use) where a
deadline or a cancellation stops them (``execution``); ``answers`` turns an outcome into a
status or a TestResponse.

May import ``aggregator.store`` (its engine-neutral contract), ``aggregator.analysis``,
``aggregator.stats`` and ``aggregator.confirm`` (lazily where SciPy would load), the shared
``aggregator.service`` modules, ``aggregator.survey_file``, ``client`` and ``protos``; never
``aggregator.service.collector`` or ``aggregator.service.server`` (which composes it).
"""
