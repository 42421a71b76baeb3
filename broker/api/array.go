package api

// ArraySubmitted is the answer to an array submit: the array's id and its
// elements' job ids, in index order.
type ArraySubmitted struct {
	ArrayID string   `json:"arrayId"`
	Count   int      `json:"count"`
	Jobs    []string `json:"jobs"`
	Indexes []int    `json:"indexes"`
}
