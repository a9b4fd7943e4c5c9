"""The rank programs: what each process of a real run executes and times (worker, with buckets, replay, decentralized,
fsdp and the clocks of timing)."""
