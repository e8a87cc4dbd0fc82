package peerset

import "slices"

// Members returns the members, sorted by name: the cache only asks for owners, a test reads the
// members a lookup gave.
func (s *Set) Members() []Peer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.members)
}
