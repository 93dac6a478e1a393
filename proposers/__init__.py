"""Engine-free proposers, one folder each (installed as `spec_plugins.proposers`)."""
