from foreign_app.app import main

main()
