package api

// SlurmRequest is the body of POST /v1/slurm/resume and /v1/slurm/suspend.
type SlurmRequest struct {
	// Nodes is a Slurm hostlist ("burst-[1-4]").
	Nodes string `json:"nodes"`
	// Jobs are the jobs slurmctld is resuming the nodes for (its
	// SLURM_RESUME_FILE); a refused node's jobs get the reason as comment.
	Jobs []SlurmResumeJob `json:"jobs,omitempty"`
}

// SlurmResumeJob is one job of SLURM_RESUME_FILE.
type SlurmResumeJob struct {
	JobID int64  `json:"job_id"`
	Nodes string `json:"nodes"`
}

// SlurmResult answers a resume or suspend, one line per node.
type SlurmResult struct {
	Nodes []SlurmNodeResult `json:"nodes"`
}

// SlurmNodeResult is what the broker did for one node: launching,
// launched (a machine was already there), refused (budget; the node is
// DOWN with Reason), failed (no offer; DOWN), suspending, or none (no
// machine to suspend).
type SlurmNodeResult struct {
	Node   string `json:"node"`
	Action string `json:"action"`
	Record string `json:"record,omitempty"`
	Offer  string `json:"offer,omitempty"`
	Reason string `json:"reason,omitempty"`
}
