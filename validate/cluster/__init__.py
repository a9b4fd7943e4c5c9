"""The emulated cluster on one machine: network namespaces with shaped links (netemu), the host's CPU load while ranks run (hostload) and the ranks' scheduling (scheduling)."""
