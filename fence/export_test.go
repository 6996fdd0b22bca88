package fence

// SetHost makes the default holder ids of this test binary name host (as
// os.Hostname would give it) until the returned func restores them. Call
// it before the clients that use it start.
func SetHost(host string) (restore func()) {
	prev := processPart
	processPart = hostPart(host) + processPart[len(hostPart(hostname())):]
	return func() { processPart = prev }
}

// HostPart is how a default holder id carries a host name.
func HostPart(host string) string { return hostPart(host) }
