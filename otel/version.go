package fencelockotel

// Version is this module's version, reported as the instrumentation
// scope's version.
const Version = "0.1.0"
