from specbench.cli import main
from specbench.core.errors import stop_on_sigterm

stop_on_sigterm()  # the process's own entry only: a test calling main() keeps its SIGTERM as it was
main()
