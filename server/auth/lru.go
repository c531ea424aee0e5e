package auth

import (
	"container/list"
	"sync"
	"time"
)

// lru is a bounded map whose entries also expire: the caches of review
// answers and lookups, and the per-caller limiters. Its size bound is
// what keeps a flood of distinct keys (forged tokens, claimed pods) from
// growing the server's memory; expiry is what bounds how stale an answer
// may be.
type lru[K comparable, V any] struct {
	mu    sync.Mutex
	size  int
	order *list.List // of *lruEntry[K, V], most recently used first
	m     map[K]*list.Element
}

type lruEntry[K comparable, V any] struct {
	key   K
	val   V
	until time.Time
}

func newLRU[K comparable, V any](size int) *lru[K, V] {
	return &lru[K, V]{size: max(size, 1), order: list.New(), m: map[K]*list.Element{}}
}

// get returns k's value if it has not expired at now.
func (c *lru[K, V]) get(k K, now time.Time) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.m[k]
	if !ok {
		var zero V
		return zero, false
	}
	e := el.Value.(*lruEntry[K, V])
	if !now.Before(e.until) {
		c.order.Remove(el)
		delete(c.m, k)
		var zero V
		return zero, false
	}
	c.order.MoveToFront(el)
	return e.val, true
}

// put stores v under k until until, dropping the least recently used
// entry when full.
func (c *lru[K, V]) put(k K, v V, until time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.putLocked(k, v, until)
}

func (c *lru[K, V]) putLocked(k K, v V, until time.Time) {
	if el, ok := c.m[k]; ok {
		e := el.Value.(*lruEntry[K, V])
		e.val, e.until = v, until
		c.order.MoveToFront(el)
		return
	}
	c.m[k] = c.order.PushFront(&lruEntry[K, V]{key: k, val: v, until: until})
	for c.order.Len() > c.size {
		last := c.order.Back()
		c.order.Remove(last)
		delete(c.m, last.Value.(*lruEntry[K, V]).key)
	}
}

// getOrPut returns k's live value, or stores and returns mk()'s until
// until: one value per key even when callers race.
func (c *lru[K, V]) getOrPut(k K, now, until time.Time, mk func() V) V {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.m[k]; ok {
		e := el.Value.(*lruEntry[K, V])
		if now.Before(e.until) {
			e.until = until
			c.order.MoveToFront(el)
			return e.val
		}
	}
	v := mk()
	c.putLocked(k, v, until)
	return v
}
