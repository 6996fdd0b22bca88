-- Release a lock only if it is still ours, and wake the waiters.
-- KEYS[1] lock
-- ARGV[1] the lock's value '<token>:<holder>', ARGV[2] channel,
-- ARGV[3] '1' to use SPUBLISH
-- Returns 1 when released, 0 when the lock is not ours (nothing deleted).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
if ARGV[3] == '1' then
  redis.call('SPUBLISH', ARGV[2], ARGV[1])
else
  redis.call('PUBLISH', ARGV[2], ARGV[1])
end
return 1
