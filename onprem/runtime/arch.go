package runtime

import goruntime "runtime"

// goArch is the OCI architecture name of this node.
func goArch() string { return goruntime.GOARCH }
