-- Release a lock only if it is still ours, handing it to the first live
-- waiter in the same call (with queue.lua, which defines the keys and the
-- shared functions, put in at the "--@" lines).
-- ARGV[1] the lock's value '<token>:<holder>'.
-- Returns 0 when the lock is not ours (nothing changed), 1 released
-- (integers, the common answers: a table costs the server more), {3,
-- value} handed over to the holder in value; {2, error} and
-- {4, value, error} the same when the notification was refused (an ACL
-- user without PUBLISH, or without the channel: the waiter learns of its
-- handover at its next heartbeat), with Redis's error.
--
-- A lock with nobody queued costs a GET, an LPOP, a DEL and a PUBLISH; a
-- handover pops the head (an LPOP, an HGET and an HDEL) and issues its
-- token in the same call.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local first = redis.call('LPOP', KEYS[3])
if not first then
  -- Nobody queued: queue.lua's free, without defining queue.lua's
  -- functions (they come below). The released value is published as
  -- versions without handover publish it: their waiters wake on any
  -- message.
  redis.call('DEL', KEYS[1])
  --elect resigned(ARGV[1])
  local r = redis.pcall(publish, KEYS[1] .. ':ch', ARGV[1])
  if type(r) == 'table' and r.err then
    return {2, r.err}
  end
  return 1
end
--@tokens
--@queue
return queue().pass_on(ARGV[1], first)
