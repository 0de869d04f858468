"""ldp-client simulate: a population of simulated devices, loaded only for it."""
