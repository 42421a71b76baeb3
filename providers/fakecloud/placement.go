package fakecloud

import (
	"net/http"
	"net/url"
)

// Placement groups of the fake EC2. A cluster group holds machines of one
// availability zone; RunInstances into an unknown group fails as EC2's
// does, and a group with live machines cannot be deleted.

type placementGroup struct {
	strategy string
}

// PlacementGroups returns the names of the groups that exist.
func (e *EC2) PlacementGroups() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for n := range e.groups {
		out = append(out, n)
	}
	return out
}

// InGroup returns the live instances in placement group name.
func (e *EC2) InGroup(name string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, id := range e.order {
		if in := e.instances[id]; in.group == name && in.terminated.IsZero() {
			out = append(out, id)
		}
	}
	return out
}

func (e *EC2) createPlacementGroup(w http.ResponseWriter, f url.Values) {
	name, strategy := f.Get("GroupName"), f.Get("Strategy")
	if name == "" || (strategy != "cluster" && strategy != "spread" && strategy != "partition") {
		writeEC2Error(w, "InvalidParameterValue", "GroupName and Strategy (cluster, spread or partition) are required")
		return
	}
	if e.groups == nil {
		e.groups = map[string]*placementGroup{}
	}
	if _, ok := e.groups[name]; ok {
		writeEC2Error(w, "InvalidPlacementGroup.Duplicate", "The Placement Group '"+name+"' already exists.")
		return
	}
	e.groups[name] = &placementGroup{strategy: strategy}
	writeEC2OK(w, "CreatePlacementGroupResponse")
}

func (e *EC2) deletePlacementGroup(w http.ResponseWriter, f url.Values) {
	name := f.Get("GroupName")
	if _, ok := e.groups[name]; !ok {
		writeEC2Error(w, "InvalidPlacementGroup.Unknown", "The Placement Group '"+name+"' is unknown.")
		return
	}
	for _, in := range e.instances {
		if in.group == name && in.terminated.IsZero() {
			writeEC2Error(w, "InvalidPlacementGroup.InUse", "The Placement Group '"+name+"' is in use.")
			return
		}
	}
	delete(e.groups, name)
	writeEC2OK(w, "DeletePlacementGroupResponse")
}

// placementCheck is RunInstances' check of Placement.GroupName: the group
// exists, and a cluster group's machines share one zone.
func (e *EC2) placementCheck(group, zone string) (code, msg string) {
	if group == "" {
		return "", ""
	}
	g, ok := e.groups[group]
	if !ok {
		return "InvalidPlacementGroup.Unknown", "The Placement Group '" + group + "' is unknown."
	}
	if g.strategy == "cluster" {
		for _, in := range e.instances {
			if in.group == group && in.terminated.IsZero() && in.zone != zone {
				return "InvalidParameterCombination", "a cluster placement group cannot span availability zones (" + in.zone + ", " + zone + ")"
			}
		}
	}
	return "", ""
}

func writeEC2OK(w http.ResponseWriter, root string) {
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	_, _ = w.Write([]byte(`<?xml version="1.0" encoding="UTF-8"?>` + "\n<" + root + ` xmlns="` + ec2Xmlns + `"><requestId>fake-request</requestId><return>true</return></` + root + ">"))
}
