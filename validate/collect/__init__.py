"""Collection: measuring traces on this machine (collect_model, collect_network and its workers) and the model zoo they
measure (models)."""
