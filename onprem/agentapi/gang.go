package agentapi

// Gang is what a member of a multi-node job needs at its start barrier
// (docs/jobs.md, "Multi-node jobs"); its rank is Assignment.Rank and the
// members' nodes are Assignment.Peers.
type Gang struct {
	// MasterAddr and MasterPort are rank 0's rendezvous address: rank 0
	// checks the port is free by listening on it through the preflight.
	MasterAddr string `json:"masterAddr"`
	MasterPort int    `json:"masterPort"`
}

// Preflight is one gang member's report while it waits at the start
// barrier: its node's versions, and what it found of MASTER_PORT.
type Preflight struct {
	// Staged: the member is placed and staged (image pulled, inputs and
	// checkpoint fetched) and waits for the release.
	Staged        bool   `json:"staged"`
	DriverVersion string `json:"driverVersion,omitempty"`
	CUDAVersion   string `json:"cudaVersion,omitempty"`
	// Image is the image digest (oci runtime); Framework the value of
	// the node's "framework" label (process runtime).
	Image     string `json:"image,omitempty"`
	Framework string `json:"framework,omitempty"`
	// Listening (rank 0): MASTER_PORT was free and rank 0 holds it open
	// for the probes; PortError says why not.
	Listening bool   `json:"listening,omitempty"`
	PortError string `json:"portError,omitempty"`
	// Probing, Probed (other ranks): the member is trying, or has tried,
	// MASTER_ADDR:MASTER_PORT; ProbeError is empty when it connected.
	Probing    bool   `json:"probing,omitempty"`
	Probed     bool   `json:"probed,omitempty"`
	ProbeError string `json:"probeError,omitempty"`
}

// GangOrder moves a member through the start barrier: Probe asks it to
// connect to the rendezvous address, Release lets its command run.
type GangOrder struct {
	JobRef
	Probe   bool `json:"probe,omitempty"`
	Release bool `json:"release,omitempty"`
}
