// Package integration holds Spillway's end-to-end tests: they build the
// real binary and run servers, agents, sshd and clouds' fakes as separate
// processes on loopback. Run them with `make test` (they are part of it).
package integration
