"""The emulated cluster on one machine: network namespaces with shaped links (netemu), the host's CPU load while
ranks run (hostload), the ranks' scheduling (scheduling), host settings shared by validators (host_settings) and
the supervisor that undoes a killed validator's changes (supervisor)."""
