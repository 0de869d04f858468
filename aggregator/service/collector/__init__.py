"""The Collector role: what devices call (survey definitions, uploads), their authentication and
registry, and everything that bounds an upload before it reaches the store."""
