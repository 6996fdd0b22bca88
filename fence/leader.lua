-- Read an election's state at one instant: an observer compares the lock
-- with the record of the last term, and a read in two commands could see
-- a handover between them.
-- KEYS[1] lock, KEYS[2] the record of the last term (see elect.lua).
-- Returns {the lock's value or nil, its PTTL, the record or nil}.
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
