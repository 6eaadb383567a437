# The plots of `make report` (bench/report.c writes the CSV): gnuplot -e "dir='report'" report.gp
# Each plot is drawn only when its CSV exists; GPU plots from dir/gpu/ the same way.
if (!exists("dir")) dir = "report"
set datafile separator ","
set terminal pngcairo size 800,520 font "sans,11" noenhanced
set key top left box opaque
set grid
set logscale x 2

cpu = dir."/cpu/"
if (system("test -f ".cpu."memory.csv && echo 1") eq "1") {
    set output dir."/memory.png"
    set title "Peak memory, forward, f32, B=1 H=8 D=128 (this CPU)"
    set xlabel "sequence length N"; set ylabel "peak MiB"; set logscale y
    plot cpu."memory.csv" using 1:2 skip 1 with linespoints lw 2 title "conventional", \
         ""              using 1:3 skip 1 with linespoints lw 2 title "fused"
    unset logscale y
}
if (system("test -f ".cpu."speedup.csv && echo 1") eq "1") {
    set output dir."/time.png"
    set title "Forward time, B=2 H=8 D=128 causal (this CPU)"
    set xlabel "sequence length N"; set ylabel "ms"; set logscale y
    plot cpu."speedup.csv" using 1:2 skip 1 with linespoints lw 2 title "f32 conventional", \
         ""               using 1:3 skip 1 with linespoints lw 2 title "f32 fused", \
         ""               using 1:5 skip 1 with linespoints lw 2 title "bf16 conventional", \
         ""               using 1:6 skip 1 with linespoints lw 2 title "bf16 fused"
    unset logscale y
}
if (system("test -f ".cpu."error_vs_n.csv && echo 1") eq "1") {
    set output dir."/error.png"
    set title "Max |out - float64|, f32, B=1 H=2 D=128 (this CPU)"
    set xlabel "sequence length N"; set ylabel "max abs error"; set logscale y
    set format y "%.0e"
    plot cpu."error_vs_n.csv" using 1:2 skip 1 with linespoints lw 2 title "conventional", \
         ""                  using 1:3 skip 1 with linespoints lw 2 title "fused"
    unset logscale y; set format y "%g"
}
if (system("test -f ".cpu."headdim.csv && echo 1") eq "1") {
    set output dir."/headdim.png"
    set title "Fixed FLOPs per query (H x D = 1024): fused time and speedup (this CPU)"
    set xlabel "head dim D"; set ylabel "fused ms"; set y2label "speedup over conventional"
    set y2tics; set ytics nomirror; set yrange [0:*]; set y2range [0:*]
    plot cpu."headdim.csv" using 1:4 skip 1 with linespoints lw 2 title "fused ms", \
         ""               using 1:5 skip 1 axes x1y2 with linespoints lw 2 title "speedup"
    unset y2tics; unset y2label; set ytics mirror; set autoscale y
}

gpu = dir."/gpu/"
if (system("test -f ".gpu."memory.csv && echo 1") eq "1") {
    set output dir."/gpu-memory.png"
    set title "Peak allocated memory, forward, bf16, B=1 H=8 D=128 (H200)"
    set xlabel "sequence length N"; set ylabel "peak MiB"; set logscale y
    plot gpu."memory.csv" using 1:2 skip 1 with linespoints lw 2 title "conventional", \
         ""              using 1:3 skip 1 with linespoints lw 2 title "fused (SDPA flash)"
    unset logscale y
}
if (system("test -f ".gpu."speedup.csv && echo 1") eq "1") {
    set output dir."/gpu-time.png"
    set title "Forward time, bf16, B=2 H=8 D=128 causal (H200)"
    set xlabel "sequence length N"; set ylabel "ms (CUDA events)"; set logscale y
    plot gpu."speedup.csv" using 1:2 skip 1 with linespoints lw 2 title "conventional", \
         ""               using 1:3 skip 1 with linespoints lw 2 title "SDPA flash", \
         ""               using 1:4 skip 1 with linespoints lw 2 title "cuDNN", \
         ""               using 1:5 skip 1 with linespoints lw 2 title "flashattn"
    unset logscale y
}
