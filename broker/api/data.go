package api

import "time"

// CheckpointReport is the body of POST /v1/jobs/{id}/checkpoint: the job
// says it saved its work at Step.
type CheckpointReport struct {
	Step int64 `json:"step"`
}

// CheckpointAnswer is what the broker recorded.
type CheckpointAnswer struct {
	Job  string    `json:"job"`
	Step int64     `json:"step"`
	At   time.Time `json:"at"`
}

// DataWaitJob is a job of the utilisation report whose GPUs waited on
// data: low compute while it read from storage.
type DataWaitJob struct {
	Job             string    `json:"job"`
	Team            string    `json:"team"`
	Since           time.Time `json:"since"`
	Last            time.Time `json:"last"`
	Active          bool      `json:"active"`
	SMUtil          int       `json:"smUtil"`
	ReadBytesPerSec int64     `json:"readBytesPerSec"`
	// Flag and Hint are for people: "GPU waits on data" and what to do.
	Flag string `json:"flag"`
	Hint string `json:"hint"`
}
