"""``ldp-client``, the device's command line: submit and flush answers, budget and cost,
selftest, device keys (``main``); its help formatter (``parsing``) and progress bars, which the
aggregator's command line and the scripts share (``progress``).

May import ``client.device``, ``client.mechanisms``, ``client.survey``, ``client.budgeting``,
``protos`` and tqdm (lazily, for bars); loads ``client.simulate`` only for ``ldp-client
simulate``; never the aggregator.
"""
