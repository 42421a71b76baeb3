package api

// ArraySubmitted is the answer to an array submit: the array's id and its
// elements' job ids, in index order.
type ArraySubmitted struct {
	ArrayID string   `json:"arrayId"`
	Count   int      `json:"count"`
	Jobs    []string `json:"jobs"`
	Indexes []int    `json:"indexes"`
}

// ArrayCancelled is the answer to cancelling an array: its jobs that
// ended now (they were waiting), those asked to stop (they ran: checkpoint
// signal, grace, kill; each is cancelled when its agent reports the end),
// and how many had ended before. Ids are in index order.
type ArrayCancelled struct {
	ArrayID   string   `json:"arrayId"`
	Count     int      `json:"count"`
	Cancelled []string `json:"cancelled"`
	Stopping  []string `json:"stopping"`
	Ended     int      `json:"ended"`
}
