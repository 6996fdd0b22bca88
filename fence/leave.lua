-- A waiter leaves the queue without the lock (its wait ended), after
-- queue.lua, which defines the keys and the shared functions.
-- ARGV[4] holder
-- A handover that raced the leave (the lock is already this holder's) is
-- passed on at once, never held for a lease; a free lock goes to the next
-- live waiter (the head may be waiting for a call to hand it over).
-- Returns {0} left, or what pass_on returns when it passed on a handover.
local me = ARGV[4]
if redis.call('HDEL', KEYS[4], me) == 1 then
  redis.call('LREM', KEYS[3], 1, me)
end
local cur = redis.call('GET', KEYS[1])
if cur then
  if holder_of(cur) == me then
    return pass_on(cur)
  end
  return {0}
end
local id, lease = live_head()
if id then
  grant(id, lease)
end
return {0}
