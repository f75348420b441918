package node

import "time"

// tick ticks c at now and returns the Ready it hands over.
func tick(c *Core, now time.Time) Ready {
	c.Tick(now)
	return c.Ready()
}
