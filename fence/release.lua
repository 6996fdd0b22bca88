-- Release a lock only if it is still ours, and wake the waiters.
-- KEYS[1] lock hash
-- ARGV[1] holder, ARGV[2] token, ARGV[3] channel, ARGV[4] '1' to use SPUBLISH
-- Returns 1 when released, 0 when the lock is not ours (nothing deleted).
local cur = redis.call('HMGET', KEYS[1], 'holder', 'token')
if cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] then
  return 0
end
redis.call('DEL', KEYS[1])
if ARGV[4] == '1' then
  redis.call('SPUBLISH', ARGV[3], ARGV[2])
else
  redis.call('PUBLISH', ARGV[3], ARGV[2])
end
return 1
