-- Release a lock only if it is still ours, and wake the waiters.
-- KEYS[1] lock
-- ARGV[1] the lock's value '<token>:<holder>', ARGV[2] channel,
-- ARGV[3] '1' to use SPUBLISH
-- Returns 1 when released, 0 when the lock is not ours (nothing deleted),
-- 2 when released but the notification was refused (an ACL user without
-- PUBLISH): the release happened, waiters elsewhere see it at expiry.
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
