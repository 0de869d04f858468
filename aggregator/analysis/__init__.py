"""Reading and analysing one survey, the same for the command line, the Analyst service and the
report: per question its histogram and labels from a report store (``survey_data``, behind
``aggregator.open_survey``), its per design key sums joined to the sampling frame
(``design_data``), and the design-based answers computed from them (``design_answers``);
anytime-valid monitoring of a question over its release history (``monitoring``) and its plain
answers (``monitor_answers``, which the Analyst's Monitor RPC and the remote client convert to
and from a MonitorResponse).

May import ``aggregator.store``, ``aggregator.stats``, ``aggregator.survey_file``,
``aggregator.histogram``, ``aggregator.errors`` and ``client``; never ``grpc``, ``protos``,
``aggregator.service``, ``aggregator.remote``, ``aggregator.jobs`` or ``aggregator.cli``: a local
read is not a remote call, so it builds no wire message and imports nothing of the service or
of a server's client.
"""
