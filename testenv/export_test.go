package testenv

// LockPort takes a port's lock as reservePort does, for a test's child
// process to try a port its parent holds.
var LockPort = lockPort

// PortsDir is where the port locks live.
var PortsDir = portsDir
