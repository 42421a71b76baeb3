package bolt

import (
	"errors"

	bbolt "go.etcd.io/bbolt"

	"github.com/spillway-dev/spillway/broker"
)

// errMember marks a transaction rolled back because one member failed.
var errMember = errors.New("batch member failed")

// commitGroup is the store's broker.GroupCommit.Commit: every member in
// one transaction. When one fails the transaction rolls back; that member
// runs alone for its own answer and the others commit together again.
func commitGroup(db *bbolt.DB, fns []func(broker.Tx) error) []error {
	errs := make([]error, len(fns))
	idx := make([]int, len(fns)) // the members still to commit, by position in fns
	for i := range idx {
		idx[i] = i
	}
	for len(idx) > 0 {
		failed := -1
		err := db.Update(func(btx *bbolt.Tx) error {
			for k, i := range idx {
				if err := broker.CallMember(fns[i], &tx{btx}); err != nil {
					failed = k
					return errMember
				}
			}
			return nil
		})
		if failed < 0 {
			for _, i := range idx {
				errs[i] = err
			}
			return errs
		}
		solo := idx[failed]
		idx = append(idx[:failed:failed], idx[failed+1:]...)
		errs[solo] = db.Update(func(btx *bbolt.Tx) error { return broker.CallMember(fns[solo], &tx{btx}) })
	}
	return errs
}
