"""Draft-length policy: hardware and model descriptions, cost model, acceptance estimators, allocator."""
