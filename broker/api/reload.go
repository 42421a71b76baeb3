package api

// ReloadResult is the answer of a reload.
type ReloadResult struct {
	File string `json:"file"`
	// Applied are the sections that changed and are live now.
	Applied []string `json:"applied"`
	// RestartNeeded are the sections that changed in the file but keep
	// their running value until a restart.
	RestartNeeded []string `json:"restartNeeded,omitempty"`
}
