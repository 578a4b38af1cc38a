"""mpsched: a Kubernetes scheduler extender that bin-packs pods onto NVIDIA MPS share units."""

__version__ = "0.1.0"
