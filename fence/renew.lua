-- Extend a lock's lease only if it is still ours.
-- KEYS[1] lock hash
-- ARGV[1] holder, ARGV[2] token, ARGV[3] lease (ms)
-- Returns 1 when extended, 0 when the key is gone, -1 when another holder
-- has it. 0 and -1 are terminal: the lock is lost.
local cur = redis.call('HMGET', KEYS[1], 'holder', 'token')
if cur[1] == false then
  return 0
end
if cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] then
  return -1
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
