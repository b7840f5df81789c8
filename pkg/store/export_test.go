package store

// SetAfterPutStart makes c call f between each put's grant (PutStart)
// and its transfer: tests stall a writer there.
func SetAfterPutStart(c *Client, f func(keys []string)) { c.afterPutStart = f }
