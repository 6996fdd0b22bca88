-- Extend a lock's lease only if it is still ours.
-- KEYS[1] lock
-- ARGV[1] the lock's value '<token>:<holder>', ARGV[2] lease (ms)
-- Returns 1 when extended, 0 when the key is gone, or the value found when
-- another acquisition has it (the client reports who took over). 0 and a
-- value are terminal: the lock is lost.
local cur = redis.call('GET', KEYS[1])
if cur == false then
  return 0
end
if cur ~= ARGV[1] then
  return cur
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
