"""The event engine, at the bottom of the simulator: SimPy rank processes (ranks), rendezvous and shared links
(events, sharing), the compute model they draw from (compute), and the protocol a training algorithm implements for
them (protocol). It knows nothing of algorithm families or their registry: simfog.simulation composes a run."""
