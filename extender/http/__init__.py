"""The HTTP face of the extender (docs/design.md, Wire protocol): kube-scheduler's wire types
(`wire`), the handlers, `make_app`, TLS with certificate reload, and the `mpsched serve` command."""
