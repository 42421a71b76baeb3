package sched

import "github.com/spillway-dev/spillway/broker"

// scratch holds buffers reused within and across cycles.
type scratch struct {
	hold     []*broker.Job
	bound    []*broker.Job // provisioning jobs bound to a burst machine
	look     []jobLook
	names    []string
	cards    []int32
	gang     []int32
	cand     []nodeCap
	pick     []nodeCap
	victims  []victim
	releases []release
	freeAt   []int32
	pos      []int32
	keys     []sortKey
	ties     []tieKey
	tiesTmp  []tieKey
	ordered  []pjob
	rank     []int32
}
