"""ldp-client, the device's command line."""
