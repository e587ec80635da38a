"""Small modules every stage of the comparator may use: the types the stages hand each other, plurals, exit
codes, this machine's GPUs. They import no other part of `compare`."""
