-- A forced release by an operator (fencectl locks release --force): delete
-- the lock only if it still has the value the operator was shown and
-- confirmed, and wake the waiters the way a holder's release does.
-- KEYS[1] lock
-- ARGV[1] the value shown, '<token>:<holder>'; ARGV[2] channel;
-- ARGV[3] '1' to use SPUBLISH (cluster)
-- Returns 1 when released, 0 when the lock changed since (nothing deleted),
-- 2 when released but the notification was refused (a user without
-- PUBLISH): waiters then see the release at their retry.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
local r
if ARGV[3] == '1' then
  r = redis.pcall('SPUBLISH', ARGV[2], ARGV[1])
else
  r = redis.pcall('PUBLISH', ARGV[2], ARGV[1])
end
if type(r) == 'table' and r.err then
  return 2
end
return 1
