"""The gRPC server as a process: start and stop, byte-level registration, ports, TLS and PKI,
worker processes and their link to the store writer, metrics, access log, health probe."""
