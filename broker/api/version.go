package api

// Version is this build's version, reported by /healthz, to agents and
// by `spillway --version`; set at build time (-ldflags -X).
var Version = "dev"
