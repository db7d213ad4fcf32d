from fbands.cli import main

raise SystemExit(main())
