// Command spillway is the one Spillway binary: the broker (`server`), the
// node agent (`agent`), and the client verbs people use every day.
package main

import (
	"os"
)

func main() {
	os.Exit(execute(os.Args[1:], os.Stdout, os.Stderr))
}
