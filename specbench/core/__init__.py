"""What every part uses and that uses no other part: errors, the cache dir, statistics, the table
renderer, module discovery, /proc/cpuinfo. Imports nothing of specbench outside this folder."""
