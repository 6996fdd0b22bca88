-- A waiter leaves the queue without the lock (its wait ended), with
-- queue.lua, which defines the keys and the shared functions, put in at
-- the "--@" lines.
-- ARGV[1] holder.
-- A handover that raced the leave (the lock is already this holder's) is
-- passed on at once, never held for a lease; a free lock goes to the next
-- live waiter (the head may be waiting for a call to hand it over).
-- Returns 0 left, or what release.lua returns when it passed on a
-- handover.
--@tokens
--@queue
local me = ARGV[1]
--elect redis.call('HDEL', KEYS[6], me)
if redis.call('HDEL', KEYS[4], me) == 1 then
  redis.call('LREM', KEYS[3], 1, me)
end
local cur = redis.call('GET', KEYS[1])
local q = queue()
if cur then
  local i = string.find(cur, ':', 1, true)
  if i and string.sub(cur, i + 1) == me then
    return q.pass_on(cur)
  end
  return 0
end
local id, lease = q.head()
if id then
  q.grant_head(id, lease)
end
return 0
