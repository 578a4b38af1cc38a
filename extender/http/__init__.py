"""The HTTP face of the extender (DESIGN §7): kube-scheduler's wire types (`wire`), the
handlers, `make_app`, TLS with certificate reload, and the `mpsched serve` command."""
